import sys

from glm5_tools.diagnostics.cli import main

sys.exit(main())
