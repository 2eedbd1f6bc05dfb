"""Numbers as the report prints them: from a thousand on, always with thousands separators."""

from grpo_lightning.report.render.formatting import fmt, fmt_interval


def test_thousands_separators_do_not_depend_on_whether_a_value_is_whole():
    # before: whole values got separators and others four significant digits without ("-4,894" beside "-5633")
    assert fmt(-4894.0) == "-4,894" and fmt(-5633.4) == "-5,633" and fmt(-8140.25) == "-8,140"
    assert fmt_interval(14_667.0, 2319.2, 27_015.3) == "14,667 [2,319, 27,015]"
    assert fmt(9999.6) == "10,000"  # rounds up to five digits, not 1e+04
    assert fmt(973.4) == "973.4" and fmt(0.5752) == "0.5752" and fmt(1.2e-05) == "1.2e-05"
    assert fmt(1234.5, 6) == "1,234.5" and fmt(3.08e11 + 0.5) == "3.08e+11"
