"""`python -m seqtool` (and `torchrun -m seqtool train ...`) runs the CLI."""

from .cli import main

if __name__ == "__main__":
    main()
