"""Checkpoints: self-contained, loaded without running code, corruption detected, averaging."""

import os
import subprocess
import sys

import pytest
import torch

from seqtool import checkpoint
from seqtool.search import beam_search
from seqtool.textio import InputError


@pytest.mark.unit
def test_round_trip_gives_identical_outputs(tiny_checkpoint, tmp_path):
    ckpt = checkpoint.load(tiny_checkpoint)
    model = checkpoint.load_model(ckpt)
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    first = beam_search(model, src, beam=3, max_len_a=0.0, max_len_b=10, nbest=3)
    again = checkpoint.load_model(checkpoint.load(tiny_checkpoint))
    second = beam_search(again, src, beam=3, max_len_a=0.0, max_len_b=10, nbest=3)
    assert [[(h.tokens, h.score) for h in s] for s in first] == [[(h.tokens, h.score) for h in s] for s in second]
    for name, value in model.state_dict().items():
        assert torch.equal(value, again.state_dict()[name])


@pytest.mark.unit
def test_checkpoint_holds_only_plain_data(tiny_checkpoint):
    raw = torch.load(tiny_checkpoint, weights_only=True)  # would raise on any pickled object
    assert raw["format_version"] == checkpoint.FORMAT_VERSION
    assert raw["model_config"]["d_model"] == 128
    assert isinstance(raw["tokenizer"], torch.Tensor)


class Exploit:
    def __reduce__(self):
        return (print, ("code ran",))


@pytest.mark.unit
def test_a_pickle_carrying_code_is_refused_not_run(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "payload": Exploit()}, path)
    with pytest.raises(InputError, match="refused"):
        checkpoint.load(path)
    assert "code ran" not in capsys.readouterr().out


class CallsSystem:
    def __reduce__(self):
        return (os.system, ("echo code ran",))


class Plain:
    pass


@pytest.mark.parametrize("payload, name", [(CallsSystem(), f"{os.system.__module__}.system"), (Plain(), f"{__name__}.Plain")],
                         ids=["blocked-module", "not-allowed-class"])
@pytest.mark.unit
def test_a_refused_pickle_is_named_by_the_python_object_it_needs(tmp_path, payload, name):
    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "payload": payload}, path)
    with pytest.raises(InputError) as error:
        checkpoint.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: refused to load: it needs the Python object {name}, ") and "\n" not in message


@pytest.mark.unit
def test_truncated_checkpoint_is_reported(tiny_checkpoint, tmp_path):
    data = tiny_checkpoint.read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or corrupted"):
        checkpoint.load(path)


@pytest.mark.unit
def test_changed_weights_are_reported_as_corruption(tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    name = next(iter(ckpt["weights"]))
    ckpt["weights"][name] = ckpt["weights"][name].clone()
    ckpt["weights"][name].view(-1)[0] += 1.0
    path = tmp_path / "flip.pt"
    torch.save(ckpt, path)
    with pytest.raises(InputError, match="sha256"):
        checkpoint.load(path)


def _edited(tiny_checkpoint, path, **changes):
    """The tiny checkpoint with its model configuration changed (its weights, and their sha256, as they were)."""
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt["model_config"] = ckpt["configs"]["model"] = {**ckpt["model_config"], **changes}
    torch.save(ckpt, path)
    return path


# the tiny checkpoint: vocab_size 24, d_model 128, n_heads 4, d_ff 512, 2 + 2 layers
@pytest.mark.parametrize("changes, words", [
    ({"d_ff": 2 ** 40}, "model.d_ff"),
    ({"d_ff": -5}, "model.d_ff"),
    ({"d_ff": 1024}, "model.d_ff = 1024 does not match the stored weights (512)"),
    ({"d_model": 256}, "model.d_model = 256 does not match the stored weights (128)"),
    ({"vocab_size": 30}, "model.vocab_size = 30 does not match the stored weights (24)"),
    ({"decoder_layers": 6}, "model.decoder_layers = 6 does not match the stored weights (2 layers)"),
    ({"n_heads": 0}, "n_heads"),
    ({"n_heads": 3}, "n_heads"),
    ({"max_positions": 2 ** 40}, "model.max_positions"),
    ({"d_ff": "512"}, "d_ff"),
])
@pytest.mark.unit
def test_an_edited_model_config_is_named_never_built(tiny_checkpoint, tmp_path, changes, words):
    path = _edited(tiny_checkpoint, tmp_path / "edited.pt", **changes)
    with pytest.raises(InputError) as error:
        checkpoint.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and words in message and message.endswith("the checkpoint is damaged or was edited")
    assert "\n" not in message


@pytest.mark.system
def test_translate_with_an_edited_checkpoint_is_one_line_not_a_bug(tiny_checkpoint, tmp_path):
    for changes in ({"d_ff": 2 ** 40}, {"d_model": 256}):
        path = _edited(tiny_checkpoint, tmp_path / "tampered.pt", **changes)
        result = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(path), "--device", "cpu"],
                                input=b"a b\n", capture_output=True, timeout=300)
        err = result.stderr.decode()
        assert result.returncode == 1 and "Traceback" not in err, err
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: {path}: model.{next(iter(changes))}") and "damaged or was edited" in line, line


@pytest.mark.unit
def test_other_format_version_is_explained(tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt["format_version"] = 42
    torch.save(ckpt, tmp_path / "v42.pt")
    with pytest.raises(InputError, match="format version 42"):
        checkpoint.load(tmp_path / "v42.pt")


@pytest.mark.unit
def test_failed_save_keeps_the_previous_file(tiny_checkpoint, tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    path.write_bytes(tiny_checkpoint.read_bytes())

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError):
        checkpoint.save({"format_version": 1}, path)
    assert path.read_bytes() == tiny_checkpoint.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left


@pytest.mark.unit
def test_average_of_identical_checkpoints_is_the_same_model(tiny_checkpoint, tmp_path):
    out = tmp_path / "avg.pt"
    checkpoint.average([tiny_checkpoint, tiny_checkpoint], out)
    a = checkpoint.load(tiny_checkpoint)["weights"]
    b = checkpoint.load(out)["weights"]
    for name in a:
        torch.testing.assert_close(a[name], b[name])


@pytest.mark.unit
def test_average_is_the_mean(tiny_checkpoint, tmp_path):
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt["weights"] = {k: v + 2.0 if v.is_floating_point() else v for k, v in ckpt["weights"].items()}
    ckpt["weights_sha256"] = checkpoint.weights_sha256(ckpt["weights"])
    torch.save(ckpt, tmp_path / "plus2.pt")
    checkpoint.average([tiny_checkpoint, tmp_path / "plus2.pt"], tmp_path / "avg.pt")
    base = checkpoint.load(tiny_checkpoint)["weights"]
    avg = checkpoint.load(tmp_path / "avg.pt")["weights"]
    name = "encoder.0.ffn.fc1.weight"
    torch.testing.assert_close(avg[name], base[name] + 1.0)
    # what it was averaged from: run folder and name, no local path travels with a model
    assert checkpoint.load(tmp_path / "avg.pt")["averaged_from"] == [f"{tiny_checkpoint.parent.name}/{tiny_checkpoint.name}",
                                                                      f"{tmp_path.name}/plus2.pt"]
