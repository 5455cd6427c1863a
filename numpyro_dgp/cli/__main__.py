"""``python -m numpyro_dgp.cli``: the ``numpyro-dgp`` command."""

import sys

from numpyro_dgp.cli import main

sys.exit(main())
