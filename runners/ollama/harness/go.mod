module chatgold/ollamaharness

go 1.19
