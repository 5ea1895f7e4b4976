"""Official SemEval CQA subtask B files (2016 layout with gold in the XML, 2017 layout with a
separate .relevancy file), written here at a tiny size."""

import pytest

from convsts.datasets.evalsets import read_cqa, read_relevancy

XML_2016 = """<?xml version="1.0" encoding="UTF-8"?>
<root>
<OrgQuestion ORGQ_ID="Q1">
  <OrgQSubject>visa renewal</OrgQSubject>
  <OrgQBody>how long does a visa renewal take?</OrgQBody>
  <Thread THREAD_SEQUENCE="Q1_R2">
    <RelQuestion RELQ_ID="Q1_R2" RELQ_RANKING_ORDER="2" RELQ_CATEGORY="Visas" RELQ_RELEVANCE2ORGQ="Irrelevant">
      <RelQSubject>best beach</RelQSubject><RelQBody>where to swim?</RelQBody>
    </RelQuestion>
    <RelComment RELC_ID="Q1_R2_C1"><RelCText>try the north</RelCText></RelComment>
  </Thread>
</OrgQuestion>
<OrgQuestion ORGQ_ID="Q1">
  <OrgQSubject>visa renewal</OrgQSubject>
  <OrgQBody>how long does a visa renewal take?</OrgQBody>
  <Thread THREAD_SEQUENCE="Q1_R1">
    <RelQuestion RELQ_ID="Q1_R1" RELQ_RANKING_ORDER="1" RELQ_CATEGORY="Visas" RELQ_RELEVANCE2ORGQ="PerfectMatch">
      <RelQSubject>visa renewal time</RelQSubject><RelQBody>renewing my visa, how many days?</RelQBody>
    </RelQuestion>
  </Thread>
</OrgQuestion>
</root>
"""


def test_2016_layout_with_gold_in_the_xml(tmp_path):
    path = tmp_path / "SemEval2016-Task3-CQA-QL-test-subtaskB.xml"
    path.write_text(XML_2016)
    df = read_cqa(path)
    assert list(df["relq_id"]) == ["Q1_R2", "Q1_R1"] and list(df["ir_rank"]) == [2, 1]
    assert list(df["relevant"]) == [False, True]
    assert (
        df.loc[0, "orgq_body"] == "how long does a visa renewal take?"
        and df.loc[1, "relq_subject"] == "visa renewal time"
    )


def test_2017_layout_with_relevancy_file(tmp_path):
    path = tmp_path / "SemEval2017-task3-English-test-input.xml"
    path.write_text(
        XML_2016.replace(' RELQ_RELEVANCE2ORGQ="Irrelevant"', "").replace(' RELQ_RELEVANCE2ORGQ="PerfectMatch"', "")
    )
    with pytest.raises(ValueError, match="Q1_R2 has no RELQ_RELEVANCE2ORGQ"):
        read_cqa(path)
    gold = tmp_path / "gold.relevancy"
    gold.write_text("Q1\tQ1_R1\t1\t0.9\ttrue\nQ1\tQ1_R2\t2\t0.1\tfalse\n")
    assert list(read_cqa(path, gold)["relevant"]) == [False, True]
    # Found beside the XML under the scorer's naming.
    (tmp_path / (path.name + ".subtaskB.relevancy")).write_text(gold.read_text())
    assert list(read_cqa(path)["relevant"]) == [False, True]
    gold.write_text("Q1\tQ1_R1\t1\t0.9\ttrue\n")
    with pytest.raises(ValueError, match="no gold label for 1 related question"):
        read_cqa(path, gold)


def test_bad_files_are_named(tmp_path):
    broken = tmp_path / "broken.xml"
    broken.write_text("<root><OrgQuestion ORGQ_ID='Q1'>\n<OrgQSubject>x</OrgQ>")
    with pytest.raises(ValueError, match=r"broken.xml:2:\d+: not well-formed XML"):
        read_cqa(broken)
    empty = tmp_path / "empty.xml"
    empty.write_text("<root/>")
    with pytest.raises(ValueError, match="not a SemEval CQA subtask B file"):
        read_cqa(empty)
    bad = tmp_path / "bad.relevancy"
    bad.write_text("Q1 Q1_R1 1 0.9 maybe\n")
    with pytest.raises(ValueError, match="bad.relevancy:1: expected"):
        read_relevancy(bad)
