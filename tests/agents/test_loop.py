"""``SideLoop.post``: a value handed to the owner's thread from any thread, without the loop."""

from __future__ import annotations

import threading

from rlzoo.agents.loop import SideLoop


def test_post_hands_values_to_the_owner_in_order_from_another_thread() -> None:
    side: SideLoop[str] = SideLoop(1, name="test-post")
    try:
        t = threading.Thread(target=lambda: [side.post("call", "ep", k) for k in range(3)])
        t.start()
        t.join()
        got = [side.wait(1.0) for _ in range(3)]
        assert [(e.what, e.subject, e.value) for e in got if e is not None] == [
            ("call", "ep", 0),
            ("call", "ep", 1),
            ("call", "ep", 2),
        ]
        assert side.wait(0.01) is None  # nothing else was put
    finally:
        side.close()
