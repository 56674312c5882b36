"""Supernode resilience testbed: rehearse training failures on Ray actors with modelled time.

Importing the package has no side effects (the environment is left as it is);
:func:`keep_ray_on_loopback` is for programs that import ``ray`` themselves.
"""

from testbed.actors.loopback import keep_ray_on_loopback

__all__ = ["keep_ray_on_loopback"]
__version__ = "0.2.0"
