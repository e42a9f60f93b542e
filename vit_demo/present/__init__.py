"""For the classroom and the stage: attention in motion (:mod:`.animate`), slide decks
(:mod:`.deck`, laid out by :mod:`.slides`), pictures side by side (:mod:`.side_by_side`) and the
survey of a whole folder as a self-contained HTML report (:mod:`.survey_report`)."""
