"""Per-step wall time, the module's perf/* phases, and a torch.profiler table of one step, with
record_function ranges around the parts of a step (named x.*)."""
import functools, importlib, json, os, time
import torch
from lightning.pytorch import Callback
from torch.profiler import record_function

TARGETS = [
    ("grpo_lightning.rollout.engine.model_forward", "ModelPasses", "_prefill"),
    ("grpo_lightning.rollout.engine.model_forward", "ModelPasses", "_emit"),
    ("grpo_lightning.rollout.engine.generator", "StaticCacheGenerator", "_decode"),
    ("grpo_lightning.rollout.engine.generator", "StaticCacheGenerator", "_step_graphs"),
    ("grpo_lightning.rollout.engine.generator", "StaticCacheGenerator", "_begin"),
    ("grpo_lightning.rollout.engine.generator", "StaticCacheGenerator", "_filled"),
    ("grpo_lightning.rollout.engine.buffers", "DecodeBuffers", "completions"),
    ("grpo_lightning.rollout.generation.sampler", None, "fast_generate_group"),
    ("grpo_lightning.rollout.generation.sampler", "RolloutSampler", "_engine"),
    ("grpo_lightning.training.module", None, "build_rollout"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "score"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "log_step"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "format_prompt"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "rollout_model"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "select"),
    ("grpo_lightning.training.module", "GroupPolicyOptimization", "advantages"),
    ("grpo_lightning.training.metrics", None, "record_rollout"),
    ("grpo_lightning.training.metrics", None, "record_rewards"),
    ("grpo_lightning.training.update", "PolicyUpdate", "micro_batch_loss"),
    ("grpo_lightning.training.update", "PolicyUpdate", "_forward"),
    ("grpo_lightning.training.update", "PolicyUpdate", "clip_and_log_gradient_norm"),
    ("grpo_lightning.training.update", "PolicyUpdate", "accumulate_gradients"),
    ("grpo_lightning.training.update", "PolicyUpdate", "loss_mask"),
    ("grpo_lightning.rollout.types", "MicroBatch", "of"),
    ("grpo_lightning.training.update", "PolicyUpdate", "update"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "update_train_step_metrics"),
    ("grpo_lightning.evaluation.diagnostics", "HealthChecks", "on_train_batch_end"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher", "__next__"),
]


def _wrap(fn, name):
    @functools.wraps(fn)
    def wrapped(*a, **k):
        with record_function(name):
            return fn(*a, **k)
    return wrapped


def install_ranges():
    for mod, cls, attr in TARGETS:
        try:
            m = importlib.import_module(mod)
            owner = getattr(m, cls) if cls else m
            raw = owner.__dict__[attr] if cls else getattr(owner, attr)
            if isinstance(raw, classmethod):
                setattr(owner, attr, classmethod(_wrap(raw.__func__, f"x.{attr}")))
            else:
                setattr(owner, attr, _wrap(raw, f"x.{attr}"))
        except Exception as e:  # noqa
            print("stepprof: no range for", mod, cls, attr, e)


class StepProfile(Callback):
    def __init__(self, step: int = 30, out: str | None = None):
        self.step, self.out = step, out or os.environ.get("OUT", "/tmp")
        self.rows, self.last, self.prof = [], None, None
        if os.environ.get("RANGES"):
            install_ranges()
        if os.environ.get("NO_CUDNN_SDP"):
            torch.backends.cuda.enable_cudnn_sdp(False)

    def on_train_batch_start(self, trainer, module, batch, idx):
        sync_step = int(os.environ.get("SYNC_STEP", "0"))
        if sync_step and trainer.global_step + 1 == sync_step and torch.cuda.is_available():
            import warnings, traceback, collections
            self.sync_sites = collections.Counter()
            self._old_show = warnings.showwarning
            def show(message, category, filename, lineno, file=None, line=None):
                if "synchroniz" in str(message):
                    frames = [f for f in traceback.extract_stack()[:-1] if "site-packages/torch" not in f.filename and "warnings" not in f.filename]
                    ours = [f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in frames[-6:]]
                    self.sync_sites[" <- ".join(reversed(ours))] += 1
                else:
                    self._old_show(message, category, filename, lineno, file, line)
            warnings.showwarning = show
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            self.syncing = True
        if trainer.global_step + 1 == self.step:
            from torch.profiler import ProfilerActivity, profile
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
        if self.last is None:
            self.last = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, idx):
        if getattr(self, "syncing", False):
            import warnings
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = self._old_show
            self.syncing = False
            tag = os.environ.get("TAG", "fit")
            with open(f"{self.out}/{tag}_syncs.txt", "w") as f:
                f.write(f"{sum(self.sync_sites.values())} synchronizing calls in step {trainer.global_step}\n")
                for site, n in self.sync_sites.most_common():
                    f.write(f"{n:4d}  {site}\n")
        now = time.perf_counter()
        perf = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("perf/") and "_s" in k}
        self.rows.append({"step": trainer.global_step, "wall_s": round(now - self.last, 4), **perf})
        self.last = now
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            ka = self.prof.key_averages()
            tag = os.environ.get("TAG", "fit")
            with open(f"{self.out}/{tag}_profile.txt", "w") as f:
                f.write(ka.table(sort_by="cpu_time_total", row_limit=80) + "\n")
                f.write(ka.table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
            self.prof.export_chrome_trace(f"/tmp/{tag}_trace.json")
            os.system(f"gzip -c /tmp/{tag}_trace.json > {self.out}/{tag}_trace.json.gz")
            self.prof = None
            self.last = time.perf_counter()

    def on_fit_end(self, trainer, module):
        tag = os.environ.get("TAG", "fit")
        with open(f"{self.out}/{tag}_steps.jsonl", "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")
