"""Authentication: twisted.cred credentials, checkers and realm; TLS (the only pyOpenSSL user)."""
