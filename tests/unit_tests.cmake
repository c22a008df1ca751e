# Unit tests of ps/ and monitor/ (in-process, fake clock). Uses pacer_test() from CMakeLists.txt.
