"""Training: the loop (train.py, read top-down) and what it calls: one optimizer update, the
learning-rate schedule, weight averaging, DDP, validation, --finetune, the run's job and SAVE_DIR,
metrics, the loss. Only the CLI imports this subpackage; the translation path never loads it."""
