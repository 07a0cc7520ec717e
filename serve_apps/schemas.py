"""The service's request and response bodies, defined in :mod:`cloudrl.serving.schemas`.

They live one layer down, in ``cloudrl/``, because the library speaks them too (the
feedback pair export, ``cloudrl loop rollout``) and ``cloudrl/`` never imports the
service. This name stays for clients and scripts that import them from here.
"""

from cloudrl.serving.schemas import *  # noqa: F403
