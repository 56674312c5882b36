"""Training programs of the program protocol: controls that resume bit for bit, and planted bugs.

``control_numpy`` and ``control_torch`` are correct; each ``bug_<component>_<what>``
is ``control_torch`` with one bug that real training code has shipped, and
the resume audit must name ``<component>``.
"""
