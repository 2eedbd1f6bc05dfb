import cProfile, pstats, sys, time, os
import grpo_lightning.cli.app, variants
from grpo_lightning import cli
args = sys.argv[1:]
t = time.perf_counter()
pr = cProfile.Profile(); pr.enable()
try:
    sys.argv = ["grpo-lightning"] + args
    cli.main()
except SystemExit:
    pass
pr.disable()
print("CELL", round(time.perf_counter() - t, 2), file=sys.stderr)
import pstats, os; pstats.Stats(pr, stream=open(os.environ.get("OUT", "/tmp") + "/cell_profile.txt", "w")).sort_stats("cumulative").print_stats(90)
