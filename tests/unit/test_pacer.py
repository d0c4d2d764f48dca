from relay.config import Rate
from relay.delivery.ratelimit import Pacer


def test_sends_are_evenly_spaced_without_bursts() -> None:
    pacer = Pacer(Rate(2, 1.0), now=100.0)
    assert pacer.available(100.0) == 1
    pacer.take(1, 100.0)
    assert pacer.available(100.2) == 0
    assert 100.5 <= pacer.ready_at(100.2) < 100.51
    assert pacer.available(pacer.ready_at(100.2)) == 1
    # A long pause does not turn into a burst afterwards.
    pacer.take(1, 1000.0)
    assert pacer.available(1000.0) == 0


def test_a_clock_going_back_does_not_stall_forever() -> None:
    pacer = Pacer(Rate(1, 1.0), now=100.0)
    pacer.take(1, 100.0)
    assert pacer.ready_at(50.0) > 100.0  # waits for the slot it promised, not longer
    assert pacer.ready_at(50.0) < 101.1


def test_a_hold_delays_the_next_send_and_pacing_resumes_after_it() -> None:
    pacer = Pacer(Rate(2, 1.0), now=0.0)
    pacer.take(1, 0.0)
    pacer.hold(30.0)
    assert pacer.available(29.9) == 0
    assert pacer.ready_at(1.0) == 30.0
    assert pacer.available(30.0) == 1
    pacer.hold(10.0)  # a shorter hold never brings the next send forward
    assert pacer.ready_at(1.0) == 30.0
