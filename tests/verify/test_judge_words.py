"""Issue 45: the sign of an effect in words: "better by 0.195%", never "worse by -0.195%"."""

from ampkit.verify.judge import describe, paired_effect


def test_negative_harm_reads_better_by_and_positive_worse_by():
    better = paired_effect([-0.002, -0.0019, -0.00195], tolerance=0.01, floor=0.0, alpha_pass=0.05, alpha_fail=0.05,
                           name="late training loss")
    text = describe(better, "BF16")
    assert "BF16 better by 0.195%" in text and "worse by -" not in text
    worse = paired_effect([0.002, 0.0019, 0.00195], tolerance=0.01, floor=0.0, alpha_pass=0.05, alpha_fail=0.05,
                          name="late training loss")
    assert "BF16 worse by 0.195%" in describe(worse, "BF16")


def test_metric_names_are_taken_whole_from_the_regex():
    from ampkit.verify.script_compare import metric_name

    assert metric_name(r"eval_loss =\s*([0-9.]+)") == "eval_loss"  # was "eval_loss =s"
    assert metric_name(r"final Loss_D: ([0-9.]+)") == "Loss_D"  # renderers say "final ...": was "final final Loss_D"
    assert metric_name(r"top-1 acc\s+(\d+\.\d+)") == "top-1 acc"
    assert metric_name("test accuracy ([0-9.]+)") == "test accuracy" and metric_name(None) == "training loss"
