"""Settings without effect: an arm whose clip settings set it apart from the other arms, but
whose clipped surrogate never clipped a token (``clip_ratio/*`` 0 at every step of every seed),
where the other arms' settings would not have clipped it either.

With one optimizer step per rollout the importance ratio is exactly 1 when the gradient is
taken, so no clip range is ever reached and arms that differ only in their clipping are the
same algorithm: no arm clips. Where some arm clipped, a bound that never clipped is without
effect only when it is the tightest of the arms' (the others' looser bounds would not have
clipped its ratios either); an unset bound (``null``) never clips and is then no evidence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from grpo_lightning.report.arms import Arm
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import join_words

#: Config keys of the clip settings; the report shows them without ``model.init_args.``.
CLIP_KEYS = ("model.init_args.loss.clip_eps_low", "model.init_args.loss.clip_eps_high", "model.init_args.loss.delta")
#: Classes that clip one ratio per sequence instead of each token's (their surrogate is ``gspo``), and
#: the surrogates that do, for an arm that names one (``model.init_args.loss.surrogate``).
SEQUENCE_CLIPPING = {"GSPO", "LUSPO"}
SEQUENCE_SURROGATES = {"gspo"}
SEQUENCE_SETTING = "sequence-level clipping"
#: The clip shares the module logs, and the bound each clip setting acts on.
CLIP_TAGS = ("clip_ratio/region", "clip_ratio/low", "clip_ratio/high")
BOUND_TAGS = {"clip_eps_low": "clip_ratio/low", "clip_eps_high": "clip_ratio/high"}


def flat(key: str) -> str:
    """The key of a run recorded before the options were grouped: ``model.init_args.loss.delta`` -> ``model.init_args.delta``."""
    return key.replace(".loss.", ".")


def clip_settings(config: Mapping[str, str]) -> dict[str, str]:
    """The clip settings of a flattened config: each of ``CLIP_KEYS`` and the clipping level."""
    settings = {key.rsplit(".", 1)[-1]: str(config.get(key, config.get(flat(key), "—"))) for key in CLIP_KEYS}
    class_name = str(config.get("model.class_path", "")).rsplit(".", 1)[-1]
    surrogate = config.get("model.init_args.loss.surrogate", config.get("model.init_args.surrogate"))
    sequence = surrogate in SEQUENCE_SURROGATES if surrogate not in (None, "None", "null") else class_name in SEQUENCE_CLIPPING
    settings[SEQUENCE_SETTING] = "yes" if sequence else "no"
    return settings


def distinct_clip_settings(settings: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """Arms whose clip settings differ from the others', with the settings that differ.

    The settings most arms share are the reference: their arms are left out and the others are
    compared with it; without such a majority every arm is compared with every other. Nothing
    when all arms clip alike.
    """
    shapes = {arm: tuple(sorted(s.items())) for arm, s in settings.items()}
    counts = Counter(shapes.values()).most_common()
    if len(counts) < 2:
        return {}
    reference = counts[0][0] if counts[0][1] > counts[1][1] else None
    distinct = {}
    for arm, shape in shapes.items():
        if shape == reference:
            continue
        others = [dict(reference)] if reference else [settings[a] for a in settings if a != arm]
        distinct[arm] = [key for key, value in settings[arm].items() if any(o.get(key) != value for o in others)]
    return distinct


def zero_throughout(arm: Arm, tag: str) -> bool | None:
    """Whether ``tag`` was 0 at every logged step of every run of ``arm`` (None: never logged)."""
    series = [run.scalars[tag] for run in arm.runs if tag in run.scalars and len(run.scalars[tag].values)]
    if not series:
        return None
    return all(float(abs(s.values).max()) == 0.0 for s in series)


def ineffective_notes(arms: Sequence[Arm], configs: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One note per arm whose distinct clip settings never clipped, where the other arms' would not have either:
    no arm clipped at all, or the arm's bound is the tightest of the arms' (``tightest``)."""
    settings = {arm.name: clip_settings(configs[arm.name]) for arm in arms if configs.get(arm.name)}
    distinct = distinct_clip_settings(settings)
    zero = {arm.name: {tag: zero_throughout(arm, tag) for tag in CLIP_TAGS} for arm in arms}
    nothing_clipped = all(value is not False for tags in zero.values() for value in tags.values())
    notes = []
    for arm in arms:
        if arm.name not in distinct:
            continue
        described = ", ".join(f"`{key}`={settings[arm.name][key]}" for key in distinct[arm.name])
        logged = [tag for tag in CLIP_TAGS if zero[arm.name][tag] is not None]
        inert = nothing_clipped or all(key in BOUND_TAGS and tightest(settings, arm.name, key) for key in distinct[arm.name])
        if logged and all(zero[arm.name][tag] for tag in logged) and inert:
            notes.append(
                f"**{user_text(arm.name)}** ({described}): {join_words(logged)} stayed 0 at every step of every seed, so "
                "its clip settings had no effect; the importance ratio never left the clip range."
            )
            continue
        for key, tag in BOUND_TAGS.items():
            unclipped = key in distinct[arm.name] and zero[arm.name][tag]
            if unclipped and (nothing_clipped or tightest(settings, arm.name, key)):
                notes.append(f"**{user_text(arm.name)}**: its `{key}`={settings[arm.name][key]} never clipped a token "
                             f"({tag} 0 at every step of every seed).")  # fmt: skip
    return notes


def bound(value: str) -> float:
    """A clip setting as a number; an unset one (``null``, ``None``, ``—``) is no bound: infinitely loose."""
    try:
        return float(value)
    except ValueError:
        return math.inf


def tightest(settings: Mapping[str, Mapping[str, str]], name: str, key: str) -> bool:
    """Whether arm ``name`` sets ``key`` to a bound no looser than any other arm's, on the same (token or
    sequence) level: the others' bounds would not have clipped what its own never did."""
    own, level = bound(settings[name].get(key, "—")), settings[name].get(SEQUENCE_SETTING)
    others = [s for arm, s in settings.items() if arm != name]
    return (math.isfinite(own) and all(s.get(SEQUENCE_SETTING) == level for s in others)
            and all(own <= bound(s.get(key, "—")) for s in others))  # fmt: skip


def effects_section(doc: Doc, notes: Sequence[str]) -> None:
    if not notes:
        return
    doc.h(2, "Settings without effect")
    doc.p(
        "Arms whose clip settings differ from the other arms' (Configuration above) but whose clipped "
        "surrogate never clipped, where the other arms' settings would not have clipped them either (no arm "
        "clipped, or theirs is the tightest bound): these settings did not shape their training. A ratio "
        "leaves 1 only when the policy moves between sampling and update (several optimizer steps per "
        "rollout: `minibatch_size` below prompts x `group_size`, or `ppo_epochs` > 1). An unset bound or a "
        "looser one that never clipped is not listed: the other arms' bound might have clipped it."
    )
    doc.items(list(notes))
