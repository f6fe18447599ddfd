"""brokerd: one message broker, four wire protocols (SSMP, MCCHAT, SMQP, socket.mq)."""

__version__ = "0.1.0"
