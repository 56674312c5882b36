"""Keep Ray on 127.0.0.1.

Ray 2.60 advertises the machine's external address even for a local
``ray.init()`` and silently rewrites ``_node_ip_address="127.0.0.1"``. Setting
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ``ray`` is first imported makes
every Ray process bind and advertise 127.0.0.1 (measured here; the test suite
checks the listening sockets of a live instance). :func:`keep_ray_on_loopback`
sets it, and usage stats off, unless the environment already says otherwise.
:mod:`testbed.actors.session`, the one module that starts Ray, calls it when it is
imported; a program that imports ``ray`` itself calls it first. If ``ray`` was
imported before, :class:`testbed.actors.session.RaySession` notices the external
address and refuses to run, saying how to fix it.

Importing the ``testbed`` package changes nothing in the environment: a
pytest session that merely has the testbed installed (its plugin is loaded
through an entry point) keeps its environment as it was.
"""

from __future__ import annotations

import os


def keep_ray_on_loopback() -> None:
    """Make a Ray started from this process (after this call) listen on 127.0.0.1 only."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
