int probe_answer(void) { return 42; }
