"""`python -m encoderkit.cli` (also what torchrun -m runs)."""
import sys

from encoderkit.cli import main

sys.exit(main())
