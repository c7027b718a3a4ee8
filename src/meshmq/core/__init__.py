"""The broker model: no sockets, no protocol syntax; time is passed in."""
