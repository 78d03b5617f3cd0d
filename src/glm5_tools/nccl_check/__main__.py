"""``python -m glm5_tools.nccl_check``: see :mod:`glm5_tools.nccl_check.allreduce`."""

import sys

from glm5_tools.nccl_check.allreduce import main

sys.exit(main())
