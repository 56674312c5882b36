"""An example testbed plugin; the testbed finds its parts through their entry points."""
