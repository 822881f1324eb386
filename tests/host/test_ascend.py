"""host.ascend: the Ascend environment read without torch."""

from __future__ import annotations

import pytest

from dancegrpo_npu.errors import DancegrpoError
from dancegrpo_npu.host import ascend


def test_visible_device_parsing():
    assert ascend.check_visible_devices("2, 3", 2, 4) == [2, 3]
    assert ascend.check_visible_devices("8,9", 2, None) == [8, 9]  # the NPUs are on another host
    with pytest.raises(DancegrpoError, match="names device 8, but this host shows NPUs 0-3"):
        ascend.check_visible_devices("8,9", 2, 4)
