"""A free TCP port for a test's launcher, picked by the kernel.

Tests run side by side (`pytest -n 2`, other jobs on the machine), so a fixed port or one derived
from the pid (`29300 + pid % 500`) can be taken by a neighbour. Binding to port 0 gets a port the
kernel chooses at random from its ephemeral range and that nothing listens on now; the short
window until the launcher binds it again is the same one `torchrun --standalone` has. Where the
launcher is torchrun, prefer `--standalone` (it picks and keeps the port itself).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
