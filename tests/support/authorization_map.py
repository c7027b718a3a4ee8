"""The authorization map the authorization tests share (socket and in-memory, STOMP and
MQTT), so that every door is tested against the same rules:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

from meshmq.config.model import AuthorizationConfig, AuthorizationEntry, AuthorizationRights, User

USERS = (User("alice", "a-pw", ("producers",)), User("bob", "b-pw", ("consumers",)),
         User("carol", "c-pw", ("admins",)), User("dave", "d-pw", ("writers",)))
MAP = AuthorizationConfig(
    entries=(
        AuthorizationEntry(queue="orders.>", read=("consumers", "admins"),
                           write=("producers", "admins"),
                           admin=("producers", "consumers", "admins")),
        AuthorizationEntry(topic="prices.>", read=("consumers",), write=("producers",),
                           admin=("producers",)),
        AuthorizationEntry(queue="logs.>", write=("writers",)),
    ),
    default=AuthorizationRights(read=("admins",), write=("admins",), admin=("admins",)),
    temp=AuthorizationRights(read=("consumers",), write=("consumers",), admin=("consumers",)),
)
PASSWORDS = {u.name: u.password for u in USERS}
