"""Keep Ray on 127.0.0.1.

Ray 2.60 advertises the machine's external address even for a local
``ray.init()`` and silently rewrites ``_node_ip_address="127.0.0.1"``. Setting
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ``ray`` is first imported makes
every Ray process bind and advertise 127.0.0.1 (measured here; the test suite
checks the listening sockets of a live instance). This module sets it, and
usage stats off, as a side effect of ``import testbed``. If ``ray`` was
imported first, :class:`testbed.raysession.RaySession` notices the external
address and refuses to run, saying how to fix it.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
