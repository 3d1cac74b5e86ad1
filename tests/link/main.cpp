// Two-translation-unit link test: both TUs include everything; the program must link and run.
int link_probe_first();
int link_probe_second();
int main() { return (link_probe_first() == 7 && link_probe_second() == 7) ? 0 : 1; }
