"""Free-text example queries for the UI from a YAML file (ui/examples.py) and the demo's file."""

from pathlib import Path

import pytest

from aoq_ui.examples import ExampleQuery, ExamplesError, load_example_queries

REPO = Path(__file__).resolve().parents[1]


def test_queries_come_in_file_order_with_their_group(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("skin tone:\n  - thumbs up with dark skin tone: 'thumbs up: dark skin tone'\n  - ' thumbs up '\n"
                    "gender:\n  - woman judge\n  - a judge in a wig: null\n")
    assert load_example_queries(path) == [
        ExampleQuery("skin tone", "thumbs up with dark skin tone", "thumbs up: dark skin tone"),
        ExampleQuery("skin tone", "thumbs up", "thumbs up"),  # a caption: its own answer
        ExampleQuery("gender", "woman judge", "woman judge"),
        ExampleQuery("gender", "a judge in a wig", None),  # free text: judged by eye
    ]


@pytest.mark.parametrize("text, message", [
    ("- a list\n", "expected a mapping of group names to lists of queries"),
    ("{}\n", "expected a mapping of group names to lists of queries"),
    ("g: a string\n", "group 'g' must be a list of non-empty strings"),
    ("g:\n  - ''\n", "group 'g' must be a list of non-empty strings"),
    ("g: [1, 2]\n", "group 'g' must be a list of non-empty strings"),
    ("g:\n  - q: 3\n", "or 'query: intended caption' entries"),
    ("g:\n  - {a: b, c: d}\n", "group 'g' must be a list"),
    ("g: [unclosed\n", "cannot read example queries"),
])
def test_a_bad_file_is_one_error_naming_it(tmp_path, text, message):
    path = tmp_path / "q.yaml"
    path.write_text(text)
    with pytest.raises(ExamplesError, match="q.yaml: ") as err:
        load_example_queries(path)
    assert message in str(err.value)


def test_a_missing_file_names_it(tmp_path):
    with pytest.raises(ExamplesError, match="missing.yaml: cannot read example queries"):
        load_example_queries(tmp_path / "missing.yaml")


def test_the_demo_file_groups_fine_grained_pairs():
    queries = load_example_queries(REPO / "configs" / "emoji_queries.yaml")
    groups = {q.group for q in queries}
    assert groups == {"skin tone", "gender", "similar objects"}
    assert "thumbs up with dark skin tone" in [q.text for q in queries]
    assert len({q.text for q in queries}) == len(queries)
    # every showcased example names the caption it intends (none is left to be judged by eye)
    intended = {q.text: q.intends for q in queries}
    assert intended["crossed fingers with dark skin tone"] == "crossed fingers: dark skin tone"
    assert intended["seven thirty on a clock"] == "seven-thirty" and None not in intended.values()
