"""Planners for the scenarios: a receding-horizon forecast MPC and a clairvoyant oracle,
both on one fluid linear program of deferrable work (:mod:`cloudrl.mpc.fluid`), solved
with HiGHS."""
