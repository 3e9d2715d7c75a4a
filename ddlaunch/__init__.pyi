# The types of ddlaunch/__init__.py, whose API names are loaded lazily by __getattr__.
from ddlaunch.api import ArrayResult as ArrayResult
from ddlaunch.api import Attempt as Attempt
from ddlaunch.api import DryRun as DryRun
from ddlaunch.api import Member as Member
from ddlaunch.api import MemberState as MemberState
from ddlaunch.api import Run as Run
from ddlaunch.api import RunStatus as RunStatus
from ddlaunch.api import Sweep as Sweep
from ddlaunch.api import SweepStatus as SweepStatus
from ddlaunch.api import WaitTimeout as WaitTimeout
from ddlaunch.api import render as render
from ddlaunch.api import runs as runs
from ddlaunch.api import submit as submit
from ddlaunch.api import sweep as sweep
from ddlaunch.config.errors import ConfigError as ConfigError
from ddlaunch.errors import UserError as UserError
from ddlaunch.slurm.client import SlurmError as SlurmError
from ddlaunch.slurm.client import SlurmUnreachable as SlurmUnreachable

__version__: str
__all__: list[str]
