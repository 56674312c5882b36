"""``python -m testbed.cli``: the ``testbed`` command."""

from testbed.cli import main

raise SystemExit(main())
