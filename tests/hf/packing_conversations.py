"""The conversations both packing tests train on: single and multi-turn, of unequal lengths."""

CONVERSATIONS = [
    {"prompt": "What is 2 plus 3?", "response": "2 plus 3 is 5."},
    {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."},
                  {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Blue, then green."}]},
    {"prompt": "Say hello.", "response": "Hello there, friend."},
    {"prompt": "Count to four.", "response": "One, two, three, four."},
]
