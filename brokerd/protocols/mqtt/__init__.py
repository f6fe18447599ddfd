"""MQTT 3.1.1 and MQTT 5.0: the sans-IO codec.

:mod:`.packets` (the packet values), :mod:`.properties` (v5 properties), :mod:`.reasons` (reason
codes and the codec's error), :mod:`.datatypes` (the wire's data types), :mod:`.decoder`
(framing, bytes in) with :mod:`.decoding` (packet bodies), :mod:`.encoder` (bytes out) with
:mod:`.publish` (one PUBLISH for many subscribers), and :mod:`.topics` (names, filters, matching,
shared subscriptions).
"""
