"""twistd plugin for brokerd: a thin shim over brokerd.tap."""
from twisted.application.service import ServiceMaker

brokerd = ServiceMaker(
    "brokerd",
    "brokerd.tap",
    "A message broker: SSMP, MCCHAT, SMQP and socket.mq on one core.",
    "brokerd",
)
