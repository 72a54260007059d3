"""`python -m ftjob_operator` is the `ftjob` command."""

import sys

from .cli import main

sys.exit(main())
