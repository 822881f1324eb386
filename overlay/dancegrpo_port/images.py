"""The rollout's PNG files, written off the critical path: a feature on the seam.

Upstream saves every decoded sample to ./images/<name>_<rank>_<sample>.png before scoring it
(and PickScore and HPSv3 read the file back).  Here the seam's ``decoded`` hands the images to
a background thread; ``image_file`` waits for what is pending before anything reads a file, and
the step does not end before every file is on disk: a write error (a full disk) stops the run
at the end of that step instead of vanishing.  Self-contained: the standard library only (PIL
through the images it is given).
"""

from __future__ import annotations

import queue
import threading

from dancegrpo_port.feature import Feature


class ImageWriter:
    """Saves PIL images on a background thread.  ``wait()`` blocks until every image handed
    over is on disk and raises the first error the thread met."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def save(self, image, path: str) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="rollout-png-writer", daemon=True)
            self._thread.start()
        self._queue.put((image, path))

    def _work(self) -> None:
        while True:
            image, path = self._queue.get()
            try:
                if self._error is None:
                    image.save(path)
            except BaseException as exc:  # noqa: BLE001  (handed to the trainer by wait())
                self._error = RuntimeError(f"writing {path} failed: {exc}")
                self._error.__cause__ = exc
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        self._queue.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def image_path(name: str, rank: int, sample: int) -> str:
    return f"./images/{name}_{rank}_{sample}.png"


class ImageFiles(Feature):
    """One PNG per sample, upstream's names, in the background (see the module doc)."""

    def __init__(self, rank: int, writer: ImageWriter | None = None):
        self.rank = rank
        self.writer = writer or ImageWriter()

    def decoded(self, images, batch_idx, name: str) -> None:
        samples = [int(i) for i in (batch_idx.reshape(-1).tolist() if hasattr(batch_idx, "reshape") else batch_idx)]
        for image, sample in zip(images, samples):
            self.writer.save(image, image_path(name, self.rank, sample))

    def image_file(self, path: str) -> None:
        self.writer.wait()

    def step_end(self, step: int, figures: dict) -> None:
        self.writer.wait()
