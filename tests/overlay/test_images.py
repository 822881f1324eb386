"""overlay/dancegrpo_port/images.py through the seam: the rollout's PNG files are written in the
background under upstream's names, waited for before a reward reads one and before the step ends,
and a write error stops the run instead of vanishing."""

from __future__ import annotations

import pytest
from overlay_runner import OVERLAY  # noqa: F401  (puts overlay/ on sys.path)

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from dancegrpo_port import hooks  # noqa: E402
from dancegrpo_port.images import ImageFiles, ImageWriter  # noqa: E402


class SlowImage:
    """Saves after the test lets it: the hand-over must not wait for the file."""

    def __init__(self, gate, color):
        self.gate, self.color = gate, color

    def save(self, path):
        self.gate.wait(5)
        Image.new("RGB", (4, 4), self.color).save(path)


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    monkeypatch.setattr(hooks, "_FEATURES", [])
    feature = ImageFiles(rank=1, writer=ImageWriter())
    hooks.install([feature])
    return tmp_path / "images"


def test_images_are_written_in_the_background_under_upstreams_names(files):
    import threading

    gate = threading.Event()
    hooks.decoded([SlowImage(gate, (i * 40, 0, 0)) for i in range(3)], torch.tensor([3, 4, 5]), "flux")
    assert not any(files.iterdir())  # handed over, not yet written
    gate.set()
    path = hooks.image_file("./images/flux_1_5.png")  # what a reward that reads the file calls first
    assert Image.open(path).getpixel((0, 0)) == (80, 0, 0)
    assert sorted(p.name for p in files.iterdir()) == ["flux_1_3.png", "flux_1_4.png", "flux_1_5.png"]


class Unwritable:
    def save(self, path):
        raise OSError(28, "No space left on device")


def test_a_write_error_stops_the_step(files):
    hooks.decoded([Unwritable()], [2], "flux")
    with pytest.raises(RuntimeError, match=r"writing \./images/flux_1_2\.png failed: .*No space left"):
        hooks.step_end(1)
    hooks.step_end(2)  # reported once, then the writer goes on
    hooks.decoded([Unwritable()], [3], "flux")
    hooks.features()[0].writer._queue.join()
    with pytest.raises(RuntimeError, match="flux_1_3.png"):  # the next hand-over reports it too
        hooks.decoded([Unwritable()], [4], "flux")
