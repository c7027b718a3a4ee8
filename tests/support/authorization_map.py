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


def _groups(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def _rights(r: AuthorizationRights) -> str:
    return (f"{{ read = {_groups(r.read)}, write = {_groups(r.write)}, "
            f"admin = {_groups(r.admin)} }}")


def auth_toml(*, anonymous_access: bool) -> str:
    """USERS and MAP as a meshmq.toml ``[auth]`` (for a broker in a subprocess)."""
    lines = ["", "[auth]", f"anonymous_access = {str(anonymous_access).lower()}", ""]
    for u in USERS:
        lines += ["[[auth.users]]", f'name = "{u.name}"', f'password = "{u.password}"',
                  f"groups = {_groups(u.groups)}", ""]
    lines.append("[auth.authorization]")
    if MAP.default is not None:
        lines.append(f"default = {_rights(MAP.default)}")
    if MAP.temp is not None:
        lines.append(f"temp = {_rights(MAP.temp)}")
    for e in MAP.entries:
        kind = f'queue = "{e.queue}"' if e.queue is not None else f'topic = "{e.topic}"'
        lines += ["", "[[auth.authorization.entries]]", kind, f"read = {_groups(e.read)}",
                  f"write = {_groups(e.write)}", f"admin = {_groups(e.admin)}"]
    return "\n".join(lines) + "\n"
