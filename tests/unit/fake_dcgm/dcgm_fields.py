"""A stand-in for DCGM's `dcgm_fields` binding (entity groups), for tests."""

DCGM_FE_GPU = 1
DCGM_FE_SWITCH = 3
