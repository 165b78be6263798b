"""Horizontal fusion of tuning trials: B configurations of one architecture trained as one model.

Small trials leave a GPU launch-bound; stacking B members along a leading dimension lets one
kernel do the work of B (HFTA, MLSys'21; Hydro, OSDI'23).
"""
