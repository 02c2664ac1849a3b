import sys

from dynspec.cli import main

sys.exit(main())
