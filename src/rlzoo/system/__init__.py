"""What rlzoo asks of the operating system: storage checks, thread waiting, fault-injection points."""
