"""The text forms of where/bbox (one parser for the CLI and the Spark bridge)."""
import pytest
from hypothesis import given, strategies as st

from rowstore.errors import QueryError
from rowstore.reads.text_forms import parse_bbox_text, parse_where_text

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(lambda s: s.lower() != "and")
ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
values = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="'\""), min_size=1,
                 max_size=12).map(str.strip).filter(bool)


@given(st.lists(st.tuples(names, ops, values), min_size=1, max_size=4))
def test_quoted_terms_joined_with_and_read_back(terms):
    text = " and ".join(f"{c} {op} '{v}'" for c, op, v in terms)
    assert parse_where_text(text) == [[c, op, v] for c, op, v in terms]


def test_where_forms():
    assert parse_where_text("speed>=30 AND name = 'a and b' and x != \"q\"") == \
        [["speed", ">=", "30"], ["name", "=", "a and b"], ["x", "!=", "q"]]
    for bad in ("speed ~ 3", "speed >", "> 3", "speed > 3 and", "1x = 2", ""):
        with pytest.raises(QueryError, match="col op value"):
            parse_where_text(bad)


def test_bbox_forms():
    assert parse_bbox_text(" loc :1,2,3.5,4") == {"column": "loc", "xmin": 1, "ymin": 2, "xmax": 3.5, "ymax": 4}
    for bad in ("loc:1,2,3", "loc 1,2,3,4", ":1,2,3,4", "loc:1,2,3,nan", "loc:1,2,3,inf", "loc:a,b,c,d"):
        with pytest.raises(QueryError, match="XMIN"):
            parse_bbox_text(bad)
