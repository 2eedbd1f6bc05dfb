"""Health checks: each check fires on the step its condition has held long enough, never before;
the callback warns once per check, counts the steps as ``health/<check>``, and prints and writes
``health.json`` when a fit ends (or stops on a reward function's error)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.evaluation.answer_spread import answer_shares, prompt_answers
from grpo_lightning.evaluation.diagnostics import HealthChecks, health_summary
from grpo_lightning.evaluation.health_checks import (
    AnswerCollapse,
    EntropyCollapse,
    EqualRewards,
    GradNormExplosion,
    HealthWarning,
    KLExplosion,
    RewardNaN,
    ShrinkingAnswers,
    CorrectionMasking,
    Truncated,
    ValAccuracyFlat,
)
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.metrics import StepMetrics
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rewards import RewardExecution, RewardFunctionWarning, RewardScorer
from grpo_lightning.rewards.scoring import RewardFunctionError

CONFIGS = config_dir()
BASE = ["--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml")]
CHECKS = ["equal_rewards", "truncated", "entropy_collapse", "kl_explosion", "grad_norm_explosion", "reward_nan",
          "shrinking_answers", "correction_masking", "val_accuracy_flat", "answer_collapse"]  # fmt: skip
ROW_KEYS = {"check", "ok", "steps", "first_step", "detail"}


def fired_at(check, values: list[dict[str, float]]) -> list[int]:
    """The steps (from 1) at which ``check`` returned its message: the first firing only."""
    return [step for step, metrics in enumerate(values, 1) if check.observe(step, metrics)]


# ---------------------------------------------------------------- each check on crafted steps


def test_equal_rewards_fires_once_the_condition_held_patience_steps_in_a_row():
    check = EqualRewards(max_fraction=0.9, patience=3)
    fractions = [1.0, 1.0, 0.5, 1.0, 0.95, 0.9, 1.0, 1.0, 1.0, 1.0]  # 0.9 itself is not over the bound
    assert fired_at(check, [{"frac_reward_zero_std": f} for f in fractions]) == [9]
    assert (check.count, check.first_step) == (2, 9)
    assert "100% of the groups had equal rewards" in check.detail and "group_size" in check.detail


def test_equal_rewards_gives_the_mean_reward_and_the_fix_for_solved_prompts_and_for_a_task_too_hard():
    """Groups all right (a solved task) and all wrong (one too hard) both have equal rewards: the message
    gives the mean reward and the fix for each, not "too hard" for a model that solves everything."""
    solved = EqualRewards(max_fraction=0.9, patience=2)
    fired_at(solved, [{"frac_reward_zero_std": 1.0, "reward": 1.0}] * 2)
    assert "100% of the groups had equal rewards (over 90%), mean reward 1 for 2 steps" in solved.detail
    assert "DifficultyCurriculum" in solved.detail and "too hard" in solved.detail
    hopeless = EqualRewards(max_fraction=0.9, patience=1)
    fired_at(hopeless, [{"frac_reward_zero_std": 0.97, "reward": 0.00125}])
    assert "97% of the groups had equal rewards (over 90%), mean reward 0.00125:" in hopeless.detail


def test_truncated_counts_every_step_it_holds_after_patience():
    check = Truncated(max_fraction=0.5, patience=2)
    ratios = [0.5, 0.75, 1.0, 1.0, 0.25, 1.0]
    assert fired_at(check, [{"completions/clipped_ratio": r} for r in ratios]) == [3]
    assert check.count == 2  # steps 3 and 4; step 6 alone is not 2 in a row
    assert "max_new_tokens" in check.detail and "mask_truncated_completions" in check.detail


def test_entropy_collapse_is_relative_to_the_first_step():
    check = EntropyCollapse(fraction=0.1, floor=0.01, patience=2)
    entropies = [2.0, 1.0, 0.5, 0.19, 0.21, 0.15, 0.1]
    assert fired_at(check, [{"entropy": e} for e in entropies]) == [7]
    assert check.first == 2.0 and "ClipCov" in check.detail


def test_entropy_collapses_fix_names_options_the_module_has():
    """The suggested fix is a command line that works: each ``--model.X`` it names is an option."""
    import inspect
    import re

    from grpo_lightning.training.module import GroupPolicyOptimization

    from grpo_lightning.training.options import GROUPS
    from grpo_lightning.training.settings import field_names

    named = re.findall(r"--model\.([\w.]+\w)", EntropyCollapse.fix)
    assert "loss.entropy_coef" in named
    options = {*inspect.signature(GroupPolicyOptimization).parameters,
               *(f"{group}.{field}" for group, cls in GROUPS.items() for field in field_names(cls))}  # fmt: skip
    assert set(named) <= options


def test_entropy_collapse_has_an_absolute_floor():
    check = EntropyCollapse(fraction=0.1, floor=0.01, patience=2)
    assert fired_at(check, [{"entropy": 0.005}] * 3) == [2]


def test_shrinking_completions_fire_when_the_mean_halves_and_some_are_a_single_token():
    """The reported drift without signal: mean length 15.5 -> 7.3 tokens, the shortest 4 -> 1."""
    check = ShrinkingAnswers(fraction=0.5, min_tokens=1, patience=2)
    steps = [(15.5, 4), (12.0, 2), (7.3, 2), (7.3, 1), (7.0, 1), (6.0, 1)]
    metrics = [{"completions/mean_length": mean, "completions/min_length": shortest} for mean, shortest in steps]
    assert fired_at(check, metrics) == [5]  # 7.3 < 7.75 with a 1-token completion at steps 4 and 5
    assert check.first == 15.5 and "warm-start" in check.detail


def test_shorter_completions_that_still_answer_do_not_fire():
    """A reward that teaches a model to stop rambling halves its length but leaves an answer in each."""
    check = ShrinkingAnswers(fraction=0.5, min_tokens=1, patience=1)
    metrics = [{"completions/mean_length": mean, "completions/min_length": 3.0} for mean in (16.0, 9.0, 6.0, 5.0)]
    assert fired_at(check, metrics) == []


def test_a_correction_masking_most_tokens_fires_after_patience_steps_and_names_its_bounds():
    """The measured Geo-RS case: 87% of the tokens masked; 50% exactly, a step at 0.9 between two below, or
    no correction (no metric) do not fire."""
    check = CorrectionMasking(max_fraction=0.5, patience=2)
    fractions = [0.5, 0.9, 0.1, 0.87, 0.87, 0.95]
    assert fired_at(check, [{"sampling/masked_fraction": f} for f in fractions]) == [5]
    assert check.count == 2  # it held at steps 5 and 6
    assert "87% of the loss tokens" in check.detail and "correction_lower" in check.detail
    assert fired_at(CorrectionMasking(patience=1), [{}, {"sampling/masked_fraction": math.nan}]) == []


def test_missing_or_nan_metrics_do_not_fire():
    for check in (EqualRewards(patience=1), Truncated(patience=1), EntropyCollapse(patience=1), KLExplosion()):
        assert fired_at(check, [{}, {"entropy": math.nan, "frac_reward_zero_std": math.nan}]) == []


def test_kl_over_its_bound_fires_after_three_steps_in_a_row_and_nan_at_once():
    check = KLExplosion(max_value=1.0)
    assert fired_at(check, [{"kl": k} for k in [0.5, 1.5, 0.5, 1.5, 1.2, 1.1]]) == [6]  # one odd batch is not enough
    assert "kl 1.1 is over 1" in check.detail and "lower optim.learning_rate" in check.detail
    check = KLExplosion()
    assert fired_at(check, [{"kl": 0.0}, {"kl": math.nan}]) == [2] and "kl is nan" in check.detail


def test_a_kl_spike_is_compared_with_the_median_once_half_the_window_is_seen():
    check = KLExplosion(spike_factor=10, window=4, patience=1)
    kls = [0.001, 0.05, 0.01, 0.012, 0.011, 0.09, 0.2]  # step 2 is early; step 6 is under 10x the median
    assert fired_at(check, [{"kl": k} for k in kls]) == [7]
    assert "times its recent median" in check.detail


def test_grad_norm_drifting_up_slowly_does_not_fire_but_a_lasting_jump_or_inf_does():
    assert fired_at(GradNormExplosion(window=4), [{"grad_norm": 1.5**i} for i in range(20)]) == []
    jump = [{"grad_norm": 1.0}] * 4 + [{"grad_norm": 11.0}] * 3
    assert fired_at(GradNormExplosion(window=8, patience=3), jump) == [7]
    assert fired_at(GradNormExplosion(), [{"grad_norm": 1.0}, {"grad_norm": math.inf}]) == [2]


def test_reward_nan_fires_on_the_first_nan_and_names_the_function():
    check = RewardNaN()
    steps = [{"rewards/exact/nan_count": 0}, {"rewards/exact/nan_count": 3, "rewards/other/nan_count": 0}]
    assert fired_at(check, steps) == [2]
    assert "'exact' returned NaN for 3 completions" in check.detail and "other" not in check.detail


def test_val_accuracy_flat_needs_three_validations_after_the_one_before_training():
    check = ValAccuracyFlat(min_validations=3, epsilon=1e-4)
    validations = [(0, 0.25), (10, 0.25), (20, 0.25), (30, 0.25), (40, 0.25)]
    fired = [step for step, accuracy in validations if check.observe(step, {"val/accuracy": accuracy, "step": step})]
    assert fired == [30] and check.count == 2


def test_val_accuracy_that_moves_is_not_flat():
    check = ValAccuracyFlat(min_validations=3)
    for step, accuracy in [(0, 0.25), (10, 0.25), (20, 0.255), (30, 0.25), (40, 0.25)]:
        assert check.observe(step, {"val/accuracy": accuracy, "step": step}) is None


def answer_collapse_at(references: list[str], completions: list[str], samples: int = 1) -> str | None:
    """What ``answer_collapse`` says of one validation's completions (one reference per prompt)."""
    per_completion = [reference for reference in references for _ in range(samples)]
    shares = answer_shares(prompt_answers(per_completion, completions, samples))
    return AnswerCollapse().holds({f"val/{name}": share for name, share in shares.items()})


def test_answer_collapse_fires_when_prompts_with_different_references_get_one_answer():
    references = ["1", "1", "1", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13"]  # "1" right 23% of the time
    completions = ["<answer>1</answer>"] * 12 + ["I think it is 1.0"]  # the same number, written otherwise
    assert answer_collapse_at(references, completions) == (
        "one answer is 100% of the validation completions (the most common reference: 23%)"
    )


def test_answer_collapse_falls_back_to_the_completion_text_without_an_answer():
    assert answer_collapse_at(["3", "4", "5", "6"], ["I cannot say.", "I  cannot say.", "I cannot say.", "no idea"])


def test_answer_collapse_is_silent_on_a_healthy_model_half_right_with_scattered_mistakes():
    references = [str(n) for n in range(10)]
    completions = [f"<answer>{n}</answer>" for n in (0, 1, 2, 3, 4, 12, 7, 7, 15, 2)]
    assert answer_collapse_at(references, completions, samples=1) is None


def test_answer_collapse_is_silent_when_the_references_are_mostly_one_value():
    references = ["yes"] * 7 + ["no"] * 3
    assert answer_collapse_at(references, ["<answer>Yes</answer>"] * 20, samples=2) is None


def test_the_scorer_counts_nan_scores_of_training_rollouts_but_not_none():
    def reward(prompts, completions, **columns):
        return [None, math.nan, 1.0, float("nan")]

    module = FakeModule()
    module.reward_functions = [("reward", reward)]
    with pytest.warns(RewardFunctionWarning):
        scores = module.reward_scorer.score(module.reward_functions, ["p"] * 4, ["c"] * 4, {})
    assert module.reward_scorer.nan_counts == {}  # validation scores the same way: not counted
    module.reward_scorer.contain(module, None, scores)
    assert module.reward_scorer.nan_counts == {"reward": 2}


# ---------------------------------------------------------------- the callback, with stand-ins


class FakeModule:
    """What the callback reads of the LightningModule, and the rows it adds to for the loggers
    (``logged``: one per step, each step one the loggers get)."""

    def __init__(self) -> None:
        self.logged_steps, self.last_step_metrics, self.logged, self.logger_row = 0, {}, [], None
        self.reward_functions = [("exact", lambda prompts, completions, **c: [math.nan] * len(completions))]
        self.reward_scorer, self.step_metrics = RewardScorer(RewardExecution(on_error="zero")), StepMetrics()

    def step(self, callback, trainer, nan: bool = False, **metrics: float) -> None:
        """One training step: the callback's hooks around it, a rollout of 2 scored if ``nan``."""
        callback.on_train_batch_start(trainer, self, None, 0)
        if nan:
            scores = self.reward_scorer.score(self.reward_functions, ["p", "q"], ["a", "b"], {})
            self.reward_scorer.contain(self, None, scores)
        self.logged_steps += 1
        trainer.global_step += 1  # one optimizer step per update
        self.last_step_metrics, self.logger_row = metrics, {}
        callback.on_train_batch_end(trainer, self, None, None, 0)
        self.logged.append(self.logger_row)


def fake_trainer(tmp_path: Path) -> SimpleNamespace:
    """What the callback reads of the Trainer: rank 0 of one process, fitting, logging to ``tmp_path``."""
    return SimpleNamespace(is_global_zero=True, world_size=1, global_step=0, loggers=[], default_root_dir=str(tmp_path),
                           callback_metrics={}, sanity_checking=False, state=SimpleNamespace(fn="fit"))  # fmt: skip


def test_the_callback_warns_once_per_check_and_logs_its_step_count_every_step(tmp_path):
    callback, module = HealthChecks(patience=2), FakeModule()
    trainer = fake_trainer(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            module.step(callback, trainer, frac_reward_zero_std=1.0)
    assert [str(w.message) for w in caught if w.category is HealthWarning] == [
        f"health check equal_rewards: {callback.checks[0].detail}"
    ]
    assert [values["health/equal_rewards"] for values in module.logged] == [0.0, 1.0, 2.0, 3.0]
    assert set(module.logged[0]) == {f"health/{name}" for name in CHECKS}
    assert float(trainer.callback_metrics["health/equal_rewards"]) == 3.0


def test_the_callback_counts_nan_scores_of_the_steps_reward_functions(tmp_path):
    callback, module = HealthChecks(), FakeModule()
    trainer = fake_trainer(tmp_path)
    original = module.reward_functions
    module.step(callback, trainer)
    with pytest.warns(HealthWarning, match="'exact' returned NaN for 2 completions"):
        module.step(callback, trainer, nan=True)
    assert module.logged[-1]["health/reward_nan"] == 1.0
    assert module.reward_functions == original


def test_a_batch_that_ends_without_a_training_step_is_not_counted(tmp_path):
    callback, module = HealthChecks(patience=1), FakeModule()
    trainer = fake_trainer(tmp_path)
    module.step(callback, trainer, frac_reward_zero_std=1.0)
    module.logger_row = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.on_train_batch_end(trainer, module, None, None, 1)  # DAPO filling its batch: no new step
    assert callback.checks[0].count == 1 and module.logger_row == {}


def test_health_json_has_one_row_per_check_in_the_report_format(tmp_path, capsys):
    callback, module = HealthChecks(patience=1), FakeModule()
    trainer = fake_trainer(tmp_path)
    module.step(callback, trainer, frac_reward_zero_std=0.0)
    with pytest.warns(HealthWarning):
        module.step(callback, trainer, frac_reward_zero_std=1.0)
    callback.on_fit_end(trainer, module)
    callback.teardown(trainer, module, "fit")
    rows = json.loads((tmp_path / "health.json").read_text())
    assert [row["check"] for row in rows] == CHECKS and all(set(row) == ROW_KEYS for row in rows)
    assert rows[0] == {"check": "equal_rewards", "ok": False, "steps": 1, "first_step": 2,
                       "detail": callback.checks[0].detail}  # fmt: skip
    assert rows[1] == {"check": "truncated", "ok": True, "steps": 0, "first_step": None, "detail": ""}
    printed = capsys.readouterr().out
    assert printed.strip() == callback.text
    assert "  WARN  equal_rewards        1 step from step 2: if the mean reward is at its best, the model solves" in printed
    assert "  ok    truncated\n" in printed and printed.isascii()


def test_disabled_the_callback_does_nothing(tmp_path):
    callback, module = HealthChecks(enabled=False, patience=1), FakeModule()
    trainer = fake_trainer(tmp_path)
    module.step(callback, trainer, frac_reward_zero_std=1.0)
    callback.on_fit_end(trainer, module)
    callback.teardown(trainer, module, "fit")
    assert module.logged == [{}] and not (tmp_path / "health.json").exists()


def test_the_summary_is_plain_ascii_with_one_line_per_row():
    rows = [{"check": "a", "ok": True, "steps": 0, "first_step": None, "detail": ""},
            {"check": "long_name", "ok": False, "steps": 2, "first_step": 3, "detail": "x. Fix: do y."}]  # fmt: skip
    assert health_summary(rows) == "health checks:\n  ok    a\n  WARN  long_name  2 steps from step 3: do y"


# ---------------------------------------------------------------- real fits through the CLI


def constant_reward(prompts, completions, **columns):
    """Every completion scores 1: every group has equal rewards."""
    return [1.0] * len(completions)


def nan_reward(prompts, completions, **columns):
    """A broken reward: NaN for every completion."""
    return [math.nan] * len(completions)


def failing_reward(prompts, completions, **columns):
    raise ZeroDivisionError("no score")


def fit_args(model_dir: str, root: Path, rewards: str, *extra: str) -> list[str]:
    """A small GRPO fit logging under ``root``: 2 prompts x 2 completions a step."""
    return [
        "fit", *BASE, "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", model_dir,
        "--model.rewards.funcs", rewards, "--model.sampling.group_size", "2", "--data.batch_size", "2",
        "--data.num_train", "12", "--data.num_val", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), "--trainer.logger.init_args.save_dir", str(root),
        "--trainer.enable_checkpointing", "false", "--trainer.callbacks=[]", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def unhealthy_fit(tiny_model_dir, tmp_path_factory, one_torch_thread) -> SimpleNamespace:
    """A 3-step fit that trips five checks: a constant reward (equal_rewards), completions that
    can't end before max_new_tokens (truncated), a NaN reward scored 0 (reward_nan) and an untrained
    model validated after every step (val_accuracy_flat) that writes the same answer to both
    validation prompts, whose references differ (answer_collapse). Patience 2."""
    root = tmp_path_factory.mktemp("unhealthy")
    rewards = f"[{__name__}.constant_reward, {__name__}.nan_reward]"
    args = fit_args(
        tiny_model_dir,
        root,
        rewards,
        "--model.sampling.max_new_tokens",
        "3",
        "--model.sampling.min_new_tokens",
        "3",
        "--trainer.max_steps",
        "3",
        "--trainer.val_check_interval",
        "1",
        "--health.patience",
        "2",
        "--model.rewards.execution.on_error",
        "zero",
    )
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        cli = GRPOLightningCLI(args=args)
    health = [str(w.message) for w in caught if issubclass(w.category, HealthWarning)]
    return SimpleNamespace(trainer=cli.trainer, out=out.getvalue(), warnings=health, log_dir=Path(cli.trainer.log_dir))


@pytest.mark.parametrize("name", ["equal_rewards", "truncated", "reward_nan", "val_accuracy_flat", "answer_collapse"])
def test_a_fit_warns_once_for_each_check_it_trips(unhealthy_fit, name):
    assert len([m for m in unhealthy_fit.warnings if m.startswith(f"health check {name}:")]) == 1


def test_a_fit_logs_the_step_counts_as_health_metrics(unhealthy_fit):
    metrics = unhealthy_fit.trainer.callback_metrics
    counts = {name: float(metrics[f"health/{name}"]) for name in CHECKS}
    # Patience 2 over 3 steps: steps 2 and 3; NaN from step 1; the validations before training and
    # after steps 1 and 2 collapse; the one after step 3 logged no row.
    expected = {name: 0.0 for name in CHECKS} | {"equal_rewards": 2.0, "truncated": 2.0, "reward_nan": 3.0,
                                                 "answer_collapse": 3.0}  # fmt: skip
    assert counts == expected


def test_a_fit_prints_the_health_summary_after_the_fit_summary(unhealthy_fit):
    out = unhealthy_fit.out
    assert out.index("fit finished:") < out.index("health checks (")
    assert "  WARN  equal_rewards        2 steps from step 2:" in out
    assert "  WARN  reward_nan           3 steps from step 1:" in out
    assert "  WARN  val_accuracy_flat    1 step from step 3:" in out
    assert "  WARN  answer_collapse      4 steps from step 0: check the rewards for a constant answer" in out
    assert "  ok    entropy_collapse\n" in out


def test_a_fit_logs_each_validations_answer_shares(unhealthy_fit):
    metrics = unhealthy_fit.trainer.callback_metrics
    assert float(metrics["val/top_answer_share"]) == 1.0 and float(metrics["val/reference_top_answer_share"]) == 0.5


def test_a_fit_writes_health_json(unhealthy_fit):
    rows = {row["check"]: row for row in json.loads((unhealthy_fit.log_dir / "health.json").read_text())}
    assert list(rows) == CHECKS
    assert rows["truncated"]["ok"] is False and rows["truncated"]["first_step"] == 2
    assert "'nan_reward' returned NaN for 4 completions" in rows["reward_nan"]["detail"]
    assert rows["entropy_collapse"] == {"check": "entropy_collapse", "ok": True, "steps": 0, "first_step": None,
                                        "detail": ""}  # fmt: skip


def test_health_json_names_the_optimizer_step_an_update_of_several_ends_at(tiny_model_dir, tmp_path, one_torch_thread):
    """Two optimizer steps per rollout (ppo_epochs 2): a NaN reward from the first rollout on is first
    seen at optimizer step 2, the x-axis of that update's metrics; two updates fire it."""
    args = fit_args(tiny_model_dir, tmp_path, f"[{__name__}.nan_reward]", "--model.sampling.max_new_tokens", "2",
                    "--model.optim.ppo_epochs", "2", "--trainer.max_steps", "4", "--trainer.limit_val_batches", "0",
                    "--model.rewards.execution.on_error", "zero")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GRPOLightningCLI(args=args)
    (path,) = tmp_path.rglob("health.json")
    row = next(row for row in json.loads(path.read_text()) if row["check"] == "reward_nan")
    assert (row["ok"], row["steps"], row["first_step"]) == (False, 2, 2)
    assert row["detail"].startswith("step 2: ")


def test_a_fit_stopped_by_a_reward_function_error_records_it(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    args = fit_args(tiny_model_dir, tmp_path, f"[{__name__}.failing_reward]", "--model.sampling.max_new_tokens", "2",
                    "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0")  # fmt: skip
    with pytest.raises(RewardFunctionError):
        GRPOLightningCLI(args=args)
    (path,) = tmp_path.rglob("health.json")
    rows = json.loads(path.read_text())
    assert [row["check"] for row in rows] == [*CHECKS, "reward_function_error"]
    assert rows[-1]["ok"] is False and rows[-1]["first_step"] == 1 and "ZeroDivisionError" in rows[-1]["detail"]
    assert (
        "  WARN  reward_function_error  1 step from step 1: the fit stopped: reward function" in capsys.readouterr().out
    )


def test_health_options_are_one_group_and_can_turn_the_checks_off(tmp_path):
    args = [*BASE, "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", "some/model"]
    cli = GRPOLightningCLI(args=[*args, "--health.patience", "3", "--health.max_kl", "2.5"], run=False)
    (health,) = [c for c in cli.trainer.callbacks if isinstance(c, HealthChecks)]
    assert health.enabled and health.checks[0].patience == 3 and health.checks[3].max_value == 2.5
    cli = GRPOLightningCLI(args=[*args, "--health.enabled", "false"], run=False)
    assert not [c for c in cli.trainer.callbacks if isinstance(c, HealthChecks) and c.enabled]


def test_a_resumed_fit_continues_the_checks_where_the_checkpoint_left_them(tmp_path):
    callback, module = HealthChecks(patience=2), FakeModule()
    trainer = fake_trainer(tmp_path)
    module.step(callback, trainer, frac_reward_zero_std=1.0, entropy=2.0, kl=0.1)
    resumed = HealthChecks(patience=2)
    resumed.load_state_dict(callback.state_dict())
    with pytest.warns(HealthWarning, match="equal_rewards"):
        module.step(resumed, trainer, frac_reward_zero_std=1.0, entropy=2.0, kl=0.1)
    assert resumed.checks[2].first == 2.0 and resumed.checks[3].history == [0.1, 0.1]


def test_a_threshold_below_one_step_is_an_error_naming_the_option():
    with pytest.raises(ConfigError, match="health.spike_patience must be at least 1, got 0"):
        HealthChecks(spike_patience=0)


def test_an_error_before_the_first_step_prints_no_health(tmp_path, capsys):
    callback, module = HealthChecks(), FakeModule()
    callback.on_exception(fake_trainer(tmp_path), module, ValueError("a configuration error"))
    assert capsys.readouterr().out == "" and not (tmp_path / "health.json").exists()
