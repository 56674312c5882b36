"""The shape of the modelled cluster: hardware presets and their links, the parallel layout, HCCL rank
tables.
"""
