"""What every part of the service uses at run time: the clock, periodic tasks, whether a
listening address is loopback."""
