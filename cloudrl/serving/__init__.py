"""The decision service's wire format, below the service that speaks it.

``schemas`` holds the request and response bodies of ``serve_apps`` (cluster states,
decisions, rollout plans, feedback trajectories); ``state`` turns a request state into the
simulator's snapshot and a policy env's observation (and back); ``errors`` names the field
of a validation error in the service's error format. The service (``serve_apps``) and the
library's clients of it (``cloudrl.feedback``'s pair export, ``cloudrl loop rollout``) both
import them from here, so nothing in ``cloudrl/`` imports the service above it.
"""
