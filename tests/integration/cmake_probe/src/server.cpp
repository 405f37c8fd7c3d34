#include <cstdio>
extern "C" int probe_answer(void);
int main() { std::printf("llama-server stand-in %d\n", probe_answer()); return 0; }
