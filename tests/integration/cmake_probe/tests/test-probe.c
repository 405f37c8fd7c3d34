/* like one of llama.cpp's tests: a program CTest runs; PROBE_FAIL (a test hook) makes it fail */
int main(void) {
#ifdef PROBE_FAIL
    return 1;
#else
    return 0;
#endif
}
