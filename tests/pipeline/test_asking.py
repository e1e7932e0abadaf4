

def test_a_multiple_choice_answer_is_shown_as_its_letter_and_its_option() -> None:
    from cic.pipeline.gates.asking import shown_answer

    options = ["London", "Paris", "Rome"]
    assert shown_answer("B", options) == "B (Paris)" and shown_answer(" C", options) == "C (Rome)"
    assert shown_answer("D", options) == "D"  # not an option: as it is
    assert shown_answer("Paris", None) == "Paris" and shown_answer("B", None) == "B"  # open questions: as they are
