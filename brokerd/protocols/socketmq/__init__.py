"""socket.mq: HTTP request-reply and WebSocket publish-subscribe on one port (see docs/socketmq.md)."""
