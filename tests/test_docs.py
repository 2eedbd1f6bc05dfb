"""The README and docs stay short, and every relative link in them leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"), REPO_ROOT / "variants" / "README.md",
     *(REPO_ROOT / "benchmarks").glob("*.md")]
)
# [text](target) outside code; images too. Targets with a scheme (https:, mailto:) are not checked.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces -> '-'."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO_ROOT)}: links that lead nowhere: {broken}"


def test_readme_is_short():
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_quickstart_installs_the_package_alone_and_the_tests_their_extra():
    readme = (REPO_ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart")[1].split("\n## ")[0]
    tests = readme.split("## Tests")[1].split("\n## ")[0]
    assert "pip install -e . && grpo-lightning-quickstart" in quickstart and "[test]" not in quickstart
    assert "pip install -e '.[test]' && python -m pytest" in tests


def test_results_holds_only_the_latest_figures():
    assert len((REPO_ROOT / "benchmarks" / "RESULTS.md").read_text().splitlines()) <= 100


def test_the_docs_the_readme_promises_exist():
    for name in ("architecture", "configuration", "performance", "scaling", "ablations", "adding_a_variant"):
        assert (REPO_ROOT / "docs" / f"{name}.md").is_file(), name


def test_the_zoos_run_time_is_stated_once_as_its_report_measured_it():
    """docs/ablations.md gives the zoo's run time, read from the committed report's provenance; the
    README and the sweep's config point there instead of stating another figure."""
    from datetime import datetime

    provenance = (REPO_ROOT / "reports" / "zoo" / "report.md").read_text()
    start, end = re.search(r"Date \(UTC\): (\S+) to (\S+)", provenance).groups()
    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    ablations = " ".join((REPO_ROOT / "docs" / "ablations.md").read_text().split())
    paragraph = ablations[ablations.index("`--config-name zoo") :][:400]
    minutes, rest = re.search(r"(\d+) min (\d+) s", paragraph).groups()
    assert int(minutes) * 60 + int(rest) == seconds
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    mention = readme[readme.index("`--config-name zoo`") - 200 :][:400]
    duration = re.compile(r"\d+ ?(?:min|minutes|s|seconds)\b")
    assert not duration.search(mention), mention
    assert not duration.search((REPO_ROOT / "configs" / "ablation" / "zoo.yaml").read_text())
