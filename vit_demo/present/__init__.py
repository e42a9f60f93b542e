"""For the classroom and the stage: attention in motion (:mod:`.animate`), slide decks
(:mod:`.deck`, laid out by :mod:`.slides`) and pictures side by side (:mod:`.side_by_side`)."""
