"""Request state <-> simulator snapshot and observation, defined in :mod:`cloudrl.serving.state`.

It lives one layer down, in ``cloudrl/``, because the feedback pair export observes stored
states exactly as the service does and ``cloudrl/`` never imports the service. This name
stays for clients and scripts that import it from here (``state_of``, ``env_state_of``).
"""

from cloudrl.serving.state import *  # noqa: F403
