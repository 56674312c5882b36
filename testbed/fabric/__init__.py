"""The modelled fabric: each rank's virtual clock, the data plane between NPU processes, the link
faults in force.
"""
